"""What is said about a run: `launch status`'s explanations, the first failure, `launch top`, what
doctor learned of each node."""
