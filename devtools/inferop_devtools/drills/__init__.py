"""Reliability and security drills against real components (control planes, tritonserver): `make drills`."""
