"""Floor 0: helpers every floor may use, importing nothing from zoo: argument checks and whole-file writes."""
