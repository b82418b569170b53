"""Model families. Importing a family module registers it; none imports its model package at import time."""
