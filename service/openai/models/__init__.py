"""`/v1/models`: the served model's card."""
