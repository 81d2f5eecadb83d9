"""`/v1/batches`: protocol (the new batch and the listing's query), serving, routes; the jobs
themselves are run by service/jobs/."""
