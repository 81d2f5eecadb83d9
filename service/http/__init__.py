"""What every route shares at the HTTP layer: the API key, the request id, reading a JSON body,
server-sent events, the request's deadline header and the in-flight cap."""
