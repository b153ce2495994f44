"""toolrun's matplotlib backend: Agg (no display), where show() returns figures as artifacts.

Selected by MPLBACKEND=module://toolrun_mpl; the runner writes this file under
/tmp/.toolrun/python (on PYTHONPATH) before the program starts.

- plt.show() saves every open figure to $TOOLRUN_OUTPUTS/figure-N.png (N counts up within
  the run) and closes it, as a notebook's inline backend does.
- savefig() without a file name saves to the next figure-N.png as well. A file name is
  used as given (a relative one is relative to the working directory, which is not the
  outputs directory: save to $TOOLRUN_OUTPUTS/name.png to get it back).
"""

import os

from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_OUTPUTS = os.environ.get("TOOLRUN_OUTPUTS", "/tmp/outputs")
_count = 0


def _next_path():
    global _count
    os.makedirs(_OUTPUTS, exist_ok=True)
    while True:
        _count += 1
        path = os.path.join(_OUTPUTS, "figure-%d.png" % _count)
        if not os.path.exists(path):
            return path


_savefig = Figure.savefig


def _savefig_default_path(self, fname=None, *args, **kwargs):
    if fname is None:
        fname = _next_path()
    return _savefig(self, fname, *args, **kwargs)


Figure.savefig = _savefig_default_path


class FigureManager(FigureManagerBase):
    def show(self):
        self.canvas.figure.savefig(_next_path())


class FigureCanvas(FigureCanvasAgg):
    manager_class = FigureManager


def show(*args, **kwargs):
    for manager in Gcf.get_all_fig_managers():
        manager.canvas.figure.savefig(_next_path())
    Gcf.destroy_all()
