"""The node process under its historical name: `Node` and `tune_gc` live in node/process/node.py
(the process wing, docs/architecture.md); this module keeps `from node.server import Node`
working for the CLI and the tests. Nothing in node/ imports it."""
from node.process.node import Node, tune_gc

__all__ = ["Node", "tune_gc"]
