"""The process wing: the parts of one running node and the process that wires them together
(node/process/node.py), with the narrow interfaces each part receives (ports.py)."""
