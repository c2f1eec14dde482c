"""What operators see: the actions shared by the command line and the status page, the tables and health
lines they draw, and the status view and page built from etcd and the coordinators' answers.
"""
