"""The node ledgers: the run's nodes.json and the site's --node-ledger file."""
