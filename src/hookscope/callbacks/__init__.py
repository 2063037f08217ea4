"""Built-in callbacks, one file per family."""
