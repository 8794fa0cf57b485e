"""Containers: their options, image references, the image pull, a node's command wrapped."""
