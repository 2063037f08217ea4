"""The doctor's engine: findings, rules and the statistics they read, independent of any training loop."""
