"""The dispatcher process: owns shards of the timer wheel and fires what is due."""
