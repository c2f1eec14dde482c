"""What online query nodes serve of each loaded collection: the only state shown to users (DESIGN rule 8).

``state`` derives, per collection, partition and replica, how much of the target (the catalog's sealed segments
of the loaded partitions and the collection's DM channels) is held by an online node of each replica; ``missing``
lists what each replica lacks by id and name; ``health`` turns that into green, yellow or red with what is
missing (``serving.explain``, above the engine, says why and what happens next). Percentages persisted in query
meta (a load's progress, the checker's last count) are only ever lowered by what is derived here (``persist``),
never raised: a plan's intent is never shown as a fact.
"""
