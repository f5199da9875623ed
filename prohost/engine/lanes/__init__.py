"""Which run may start next (§4): the pure lane queue and its trio scheduler."""
