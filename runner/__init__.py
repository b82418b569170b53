"""Runs cases in isolation: one supervisor (timeouts, crashes, memory cap, reference probe, warm-up) over
three transports (a pool of local workers, Ray actors, a fresh process per case), the suite loop with its
reporter plugins, the reference cache, and the pytest plugin the suites' pytest routes share."""
