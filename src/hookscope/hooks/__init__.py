"""The inspection half: select modules, own their hooks, capture and summarise what they do."""
