"""Frozen code: --snapshot's tree, store, selection and stat cache; the torch extension cache."""
