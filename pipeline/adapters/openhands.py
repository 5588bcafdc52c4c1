ADAPTER = None  # placeholder
