"""SSH connections and clusters: the one connection model, its paramiko and OpenSSH renderings,
hosts and the SSH watch, the clusters file and --cluster."""
