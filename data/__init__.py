"""Task data: generators and loaders (see data/tasks.py)."""
