"""`/v1/chat/completions`: protocol (the request), template (the messages rendered),
serving, shape (the reply), routes."""
