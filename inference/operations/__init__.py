"""Running the server: the process runtime and model swap, the heartbeat and replicas, the live
dashboard, metrics, the request log and the system checks."""
