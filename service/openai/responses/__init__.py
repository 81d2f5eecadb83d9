"""`/v1/responses`, stateless: protocol (the request), serving, shape (the response object),
events (its stream), routes."""
