"""A hook for tests: each rank saves its weights after training (imported via custom_imports)."""
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class DumpRankWeightsHook(Hook):
    def after_run(self, runner):
        model = getattr(runner.model, 'module', runner.model)
        torch.save(model.state_dict(), osp.join(runner.work_dir, f'rank{get_rank()}_weights.pt'))
