// placeholder: this module's sources replace this file.
