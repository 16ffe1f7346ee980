"""`kcm demo`: the whole pipeline on one machine, with real clients and a live view of what arrives."""
