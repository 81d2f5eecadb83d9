"""`/v1/completions`: protocol (the request), serving, shape (the reply), routes."""
