"""The Files and Batch APIs: uploaded files, batches of requests run at low priority, their results."""
