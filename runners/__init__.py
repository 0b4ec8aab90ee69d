"""Runners: what produces traces (`tracekit profile`). Not written yet: see the runners issue."""
