"""Ray Serve glue: each deployment wraps one library service from `app/`."""
