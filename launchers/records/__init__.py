"""The run dir's records (its paths: launchers.layout): RunDir and the per-rank/node records, a run
dir read as data others may write, fencing, the manifest, the runs index, --notify's events."""
