"""Indexes and their documents: an owner, and grants to users, groups or everyone (gateway/access.py decides
who may read, edit or own each one). An index the caller may not use as asked is a 404.

Each gateway index maps to one worker table with a unique name (`u<owner>_<slug>_<random>`), so two users
may both call an index "contracts". Uploads are forwarded to the worker's /add_document, which stores the
original under UPLOADS_DIR/<table>/<dataset>/<file> on the shared volume and indexes it; the worker owns the
file (one writer, no double copy), the gateway keeps the record in its database. Deleting an index drops the
worker table, the folder and the rows.

routes.py (the index and document routes), uploads.py (an upload, as JSON or as its indexing's events),
records.py (rows and their JSON), sharing.py (grants and ownership transfer), names.py (table, dataset and file names), builds.py (a (re)build
that outlives its page), reconcile.py (the rows made to match the worker's table), demo.py (the first user's
`demo` index).
"""
