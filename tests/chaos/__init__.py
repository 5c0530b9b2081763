"""The fault-injection proof of issue 7: the real fleet under SIGKILLs, SIGSTOPs and service
restarts, judged from an execution log the handlers write (see docs/operations/chaos.md)."""
