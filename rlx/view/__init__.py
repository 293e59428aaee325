"""`rlx view`: a local page over run directories (app.py: the server and the export; data.py: runs, metrics,
configs, eval results; samples.py: the sample browser's groups and filters; health.py: the health flags;
static/: the page and its vendored chart library)."""
