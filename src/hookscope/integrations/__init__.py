"""hookscope's doctor and statistics inside other training loops: one module per framework.

``hookscope.integrations.lightning``, ``.fastai`` and ``.transformers`` each define a
``HookscopeCallback`` for that framework's trainer. Each feeds the same engine as ``hs.watch`` and the
Learner's ``Doctor``, so a fault gets the same ``Finding`` whatever the loop. Each module imports its
framework when it is imported, and hookscope itself never imports them: ``pip install
'hookscope[integrations]'`` installs the three frameworks. See docs/integrations.md.
"""
