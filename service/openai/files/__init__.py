"""`/v1/files`: protocol (the upload's form and the listing's query), serving, routes."""
