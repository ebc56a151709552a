"""Contracts between oven's processes: typed messages and their one codec."""
