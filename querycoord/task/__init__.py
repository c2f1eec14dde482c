"""Task trees: the model, their persistence in etcd, and the scheduler that runs them."""
