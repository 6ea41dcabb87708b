"""Workloads that drive the proxy, the training phase and the simulator."""
