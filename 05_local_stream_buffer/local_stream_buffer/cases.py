"""Which relation between the two records made a pair.

The case is a function of the pair and the two complete streams, never of the arrival order, so every
interleaving labels a pair the same way:

==================  ==========================================================  ===========================
case                the pair (l, r) is ...                                      the seed's name
==================  ==========================================================  ===========================
SAME_TIME           l and r have the same time (each is the other's neighbour)  JR2 (the seed emitted it twice)
LEFT_SUCCESSOR      r is l's successor (earliest right record at or after l)    JS2 or JR2, whichever arrived last
RIGHT_SUCCESSOR     l is r's successor                                          JS2 or JR2, whichever arrived last
LEFT_PREDECESSOR    r is l's predecessor, and l is not r's successor            JR1 (none if the left was late)
RIGHT_PREDECESSOR   l is r's predecessor, and r is not l's successor            JR1 (none if the right was late)
==================  ==========================================================  ===========================

A pair that is both a successor and a predecessor pair (adjacent records with nothing in between) is
labelled as the successor pair. The seed's JR2 (new record is the successor of buffered ones) and JS2
(buffered record is the successor of the new one) are both successor pairs seen from different sides;
its JR1 (the new record's predecessor in its own stream is the predecessor of buffered ones) is a
predecessor pair. The predecessor pair of a record whose other stream had already moved past it when
it arrived has no seed name: the seed dropped it, which is why its shuffled tests counted fewer joins.
"""

from enum import IntEnum


class JoinCase(IntEnum):
    SAME_TIME = 0
    LEFT_SUCCESSOR = 1
    LEFT_PREDECESSOR = 2
    RIGHT_SUCCESSOR = 3
    RIGHT_PREDECESSOR = 4

    @property
    def label(self) -> str:
        """The lower-case name used in output records, e.g. 'left_successor'."""
        return self.name.lower()


# Plain int codes (JoinCase values, cheaper to pass and index on the hot path), indexed by the side
# (0 = left, 1 = right) of the record whose neighbour the partner is.
SUCCESSOR_CASE = (int(JoinCase.LEFT_SUCCESSOR), int(JoinCase.RIGHT_SUCCESSOR))
PREDECESSOR_CASE = (int(JoinCase.LEFT_PREDECESSOR), int(JoinCase.RIGHT_PREDECESSOR))
# Labels indexed by case code.
CASE_LABELS = tuple(case.label for case in JoinCase)
