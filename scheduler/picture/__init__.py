"""The sidecar's picture of the cluster between two calls: where it comes from, and the planner's views of it.

`feed` is the one Protocol both sources (a snapshot file, the API server) satisfy; `cache`
keeps the last snapshot, its views and the sidecar's own binds; `views` turns a snapshot into
the free GPUs of every node; `classes` groups nodes that answer every question alike.
"""
