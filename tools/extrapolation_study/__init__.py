"""The extrapolation study (tools/extrapolation.py, its command line and its
documentation): how each RoPE method behaves past the training length.

Its modules, each importing only those above it:

    files     every output written whole or not at all (write_output: a temporary
              renamed), cell files read as JSON with their checks (read_json),
              what a path is when a folder was expected (folder_problem)
    config    the factors, methods and studies (FULL, QUICK); a method's flags at
              a factor (method_flags); the cells' names
    stats     the Wilson interval, the bootstrap band of NLL by position, and how
              perplexities, cells and durations are written
    fanout    what the fine-tune and attention studies share with this one: the
              fan-out's command line, cell files written and read, a pool of cells
    commands  where the files are (ROOT, SHARED, RUN), how paths are shown (Where),
              the `run` commands of a cell, running them (run_json,
              passkey_by_trials)
    texts     texts cut at white space by run's token count, and the sinks cell
              that streams them segment by segment (stream_cell)
    plan      the plan of cells: the studies (Study, make_studies), their cells as
              jobs (ppl_jobs, passkey_jobs), the options that choose them
    cells     running a cell and writing its file (run_cell, run_cells), reading
              cell files back and checking what they hold (read_cells)
    tables    table.md's text, results.csv and passkey.csv
    plots     the plots, and --replot
    collect   the cell files of a plan to result rows (collect) and to the
              outputs (write_outputs)
    modes     what each mode of the command line does (study_main, list_main,
              cell_main, collect_main, stream_cell_main)
"""
