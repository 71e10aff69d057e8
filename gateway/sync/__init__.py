"""Index sources: server folders and S3-compatible buckets an index is kept in step with.

- routes.py: `GET/POST /api/indexes/{id}/sources`, `GET/PATCH/DELETE /api/indexes/{id}/sources/{source_id}`,
  `POST .../sources/{source_id}/sync` (202 with the job). Reading needs read access to the index; changing and
  syncing, edit access; anything else is a 404. Credentials are write-only.
- kind.py: the `sync` job kind: contract/sync.py's run with the gateway as target (each added or changed file
  sent to the worker's /add_document and recorded as the index's document; each removed one deleted there),
  every file it acted on a file of the job.
- schedule.py: each replica's scheduler: a source whose `next_run_at` passed is claimed with one conditional
  UPDATE (so of several replicas one queues it) and queued as a sync job.
"""
