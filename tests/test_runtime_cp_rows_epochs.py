"""Layout epochs (`cp_rows.note_epoch`) are counted per process group without keeping the group alive (rev56 R11:
a module-global dict held every group ever used); the world (None) is counted too."""

import gc
import weakref

from orchmllm.runtime import cp_rows


class Group:
    """Stands for a ProcessGroup (which takes weak references too)."""


def test_regression_a_group_no_longer_used_is_not_kept_by_its_epochs():
    group = Group()
    cp_rows.note_epoch(group)
    cp_rows.note_epoch(group)
    assert cp_rows.epoch(group) == 2 and cp_rows.epoch(Group()) == 0
    gone = weakref.ref(group)
    del group
    gc.collect()
    assert gone() is None


def test_the_worlds_epochs_are_counted():
    before = cp_rows.epoch(None)
    cp_rows.note_epoch(None)
    assert cp_rows.epoch(None) == before + 1
