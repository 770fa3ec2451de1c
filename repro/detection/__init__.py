"""The detection-power study: planted faults x positions x windows and no-fault controls, its matrix and page."""
