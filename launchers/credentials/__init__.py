"""Secrets: what looks like a credential, and which values of a job are secret and how they travel
(never a value in a record)."""
