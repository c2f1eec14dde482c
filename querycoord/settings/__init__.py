"""Options and configuration of every process: the dataclasses, the TOML file and environment layers, the
option tables of the coordinator, etcd and security, the one rule table every setting is checked against, and
logging. A bad setting is one error line naming key and source, at start.
"""
