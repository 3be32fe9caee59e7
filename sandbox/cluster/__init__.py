"""Executions on a Ray cluster (issue 22): the caller's executor, each node's sandbox host, their wire.

Host-side only: nothing here is imported inside a sandbox, and nothing Ray carries enters one.
"""
