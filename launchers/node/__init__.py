"""A node's side besides its entry programs: how the rank wrapper starts its program and why a rank
died, the preflight's node check, the memory checkpoint store."""
