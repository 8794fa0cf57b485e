"""The CLI's parts besides the `launch` group: the verbs that look at runs, doctor, nodes, what they
share, and how options read and complete."""
