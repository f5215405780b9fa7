"""The training process around the step: its servers, threads and children.

``services.py`` starts and stops the servers one rank runs; ``standby.py`` is a warm standby,
a process that has imported torch and replicaft and waits to become a restarted group; ``threads.py`` the library's
background threads; ``process_tree.py`` the processes below a launcher; ``reserve.py`` memory
faulted in ahead of a restarted group's need; ``faults.py`` named fault points for chaos tests;
``_forkserver.py`` what the DataLoader workers' forkserver imports.
"""
