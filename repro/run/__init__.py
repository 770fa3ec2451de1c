"""Executing a run: engine children, the arm scheduler, load neighbours, the work folder, disk watch."""
