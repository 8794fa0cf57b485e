"""Secrets: what looks like a credential, and which values of a job are secret and how they travel
(never a value in a record)."""

# the secrets each rank's wrapper checks before its program starts (their names; secretenv.unusable)
NAMES_ENV = "LAUNCH_PRIVATE_ENV"
