"""The parsing pieces of a job's options (declared in launchers.runopts): values, profiles, each
flag's parser, help texts, the API's flag words, sbatch's grammar, --notify's targets."""
