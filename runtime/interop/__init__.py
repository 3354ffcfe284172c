"""Other libraries' names for this project's places: ``transformer_lens`` (hook names
to addresses and back)."""
