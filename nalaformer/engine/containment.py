"""A run deletes and replaces files only inside its work dir.

mmengine's ``CheckpointHook`` deletes the previous best checkpoint and the checkpoints beyond ``max_keep_ckpts``
by the paths it keeps in the message hub, and a checkpoint carries that message hub: resuming a copied (or
moved) work dir would delete the original's files by their absolute paths. :class:`ContainedCheckpointHook`,
which :class:`~nalaformer.engine.checkpoint.NaLaRunner` puts in place of every ``CheckpointHook`` (configs need
no change), re-roots such bookkeeping into the work dir, or forgets it, with a log line; and every path it is
about to delete goes through one check (:func:`nalaformer.files.contained`): a path outside the run's folders
is never deleted. Preemption checkpoints (``iter_<N>.pth`` of :mod:`nalaformer.engine.preemption`) join the
rotation: once a newer regular checkpoint is written they are deleted (unless ``max_keep_ckpts`` is -1).
"""
import logging
import os.path as osp
from typing import Optional

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ..files import contained
from .preemption import PREEMPTION_CHECKPOINTS

__all__ = ['ContainedCheckpointHook', 'contained_checkpoint_hook']


class _ContainedRemoval:
    """A file backend whose ``remove`` / ``rmtree`` act only on paths the hook contains; the rest is the backend's."""

    def __init__(self, backend, hook: 'ContainedCheckpointHook'):
        self._backend, self._hook = backend, hook

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def remove(self, path) -> None:
        if self._hook.may_delete(path):
            self._backend.remove(path)

    def rmtree(self, path) -> None:
        if self._hook.may_delete(path):
            self._backend.rmtree(path)


@HOOKS.register_module()
class ContainedCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` that deletes only inside the run's work dir (and its own ``out_dir``, when
    one is set), and re-roots the paths restored from a resumed checkpoint (``best_ckpt*``, ``last_ckpt``) into
    its folder: a path elsewhere becomes the file of the same name here when there is one, else it is dropped."""

    _work_dir: Optional[str] = None

    @property
    def file_backend(self):
        return self.__dict__.get('_file_backend')

    @file_backend.setter
    def file_backend(self, backend) -> None:  # mmengine sets it in before_train, then deletes through it
        self._file_backend = _ContainedRemoval(backend, self)

    def _roots(self):
        return [root for root in (self._work_dir, getattr(self, 'out_dir', None))
                if isinstance(root, str) and '://' not in root]

    def may_delete(self, path) -> bool:
        """Whether ``path`` lies inside the run's folders; a path that does not is named in a warning and kept."""
        path = str(path)
        if '://' in path or any(contained(path, root) for root in self._roots()):
            return True
        print_log(f'not deleting {path}: it lies outside this run\'s work dir {self._work_dir}', logger='current',
                  level=logging.WARNING)
        return False

    def _reroot(self, what: str, path):
        """``path`` (restored bookkeeping) if it is inside the run's folders, else the file of its name in
        ``out_dir`` when that exists, else None; a changed path is logged."""
        if not path or '://' in str(path) or '://' in str(self.out_dir) or \
                any(contained(path, root) for root in self._roots()):
            return path
        here = osp.join(self.out_dir, osp.basename(str(path)))
        if osp.exists(here):
            print_log(f'{what} restored from the checkpoint, {path}, lies outside the work dir {self._work_dir} '
                      f'(a copied or moved work dir): using {here}', logger='current')
            return here
        print_log(f'{what} restored from the checkpoint, {path}, lies outside the work dir {self._work_dir} and '
                  f'{self.out_dir} has no file of that name: forgotten (nothing outside the work dir is deleted)',
                  logger='current', level=logging.WARNING)
        return None

    def before_train(self, runner) -> None:
        self._work_dir = runner.work_dir
        super().before_train(runner)
        hub = runner.message_hub
        if self.save_best is not None:
            if len(self.key_indicators) == 1:
                self.best_ckpt_path = self._reroot('the best checkpoint', self.best_ckpt_path)
                if 'best_ckpt' in hub.runtime_info:
                    hub.update_info('best_ckpt', self.best_ckpt_path)
            else:
                for key, path in self.best_ckpt_path_dict.items():
                    self.best_ckpt_path_dict[key] = self._reroot(f'the best {key} checkpoint', path)
                    if f'best_ckpt_{key}' in hub.runtime_info:
                        hub.update_info(f'best_ckpt_{key}', self.best_ckpt_path_dict[key])
        if 'last_ckpt' in hub.runtime_info:
            hub.update_info('last_ckpt', self._reroot('the last checkpoint', hub.get_info('last_ckpt')))

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        """mmengine's (rotation beyond ``max_keep_ckpts``, then the checkpoint), then the preemption checkpoints
        of the run (:mod:`nalaformer.engine.preemption`) deleted: a newer regular checkpoint now exists."""
        hub = runner.message_hub
        preempted = hub.get_info(PREEMPTION_CHECKPOINTS) or []
        if self.max_keep_ckpts > 0 and preempted:
            hub.update_info(PREEMPTION_CHECKPOINTS, [])  # the checkpoint written now no longer lists them
        super()._save_checkpoint_with_step(runner, step, meta)
        if self.max_keep_ckpts <= 0 or not preempted or not is_main_process():
            return
        regular = {self.filename_tmpl.format(kept) for kept in getattr(self, 'keep_ckpt_ids', ())}
        regular.add(self.filename_tmpl.format(step))
        for name in preempted:
            path = osp.join(runner.work_dir, osp.basename(name))
            if osp.basename(name) not in regular and osp.isfile(path) and self.may_delete(path):
                self.file_backend.remove(path)
                runner.logger.info(f'deleted the preemption checkpoint {path}: {self.filename_tmpl.format(step)} '
                                   f'is newer')


def contained_checkpoint_hook(hook):
    """``hook`` (a hook or its config), with mmengine's ``CheckpointHook`` replaced by :class:`ContainedCheckpointHook`
    (subclasses and other hooks are kept)."""
    if isinstance(hook, dict):
        kind = hook.get('type')
        cls = kind if isinstance(kind, type) else HOOKS.get(kind) if isinstance(kind, str) else None
        return dict(hook, type=ContainedCheckpointHook) if cls is CheckpointHook else hook
    if type(hook) is CheckpointHook:
        hook.__class__ = ContainedCheckpointHook
    return hook
