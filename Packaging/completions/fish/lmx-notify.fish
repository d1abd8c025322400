function __lmx-notify_should_offer_completions_for_flags_or_options -a expected_commands
    set -l non_repeating_flags_or_options $argv[2..]
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-notify_parse_tokens
    test "$commands" = "$expected_commands"; and return $non_repeating_flags_or_options_absent
end

function __lmx-notify_should_offer_completions_for_positional -a expected_commands positional_index_comparison expected_positional_index
    set -l non_repeating_flags_or_options
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-notify_parse_tokens
    test "$commands" = "$expected_commands" -a \( "$positional_index" "$positional_index_comparison" "$expected_positional_index" \)
end

function __lmx-notify_parse_tokens -S
    set -l unparsed_tokens (__lmx-notify_tokens -pc)
    switch $unparsed_tokens[1]
    case 'lmx-notify'
        __lmx-notify_parse_subcommand 0 'socket=' 'interval=' 'expiry-warning=' 'open-with=' 'version' 'h/help'
        switch $unparsed_tokens[1]
        case 'help'
            __lmx-notify_parse_subcommand -r 1 'version'
        end
    end
end

function __lmx-notify_tokens
    if test (string split -m 1 -f 1 -- . "$FISH_VERSION") -gt 3
        commandline --tokens-raw $argv
    else
        commandline -o $argv
    end
end

function __lmx-notify_parse_subcommand -S -a positional_count
    argparse -s r -- $argv
    set -l option_specs $argv[2..]
    set -l is_repeating_positional $_flag_r
    set -el _flag_r
    set -a commands $unparsed_tokens[1]
    set positional_index 0
    while true
        set -e unparsed_tokens[1]
        argparse -sn "$commands" $option_specs -- $unparsed_tokens 2> /dev/null
        set unparsed_tokens $argv
        set positional_index (math $positional_index + 1)
        for non_repeating_flag_or_option in $non_repeating_flags_or_options
            if set -ql "_flag_$(string replace -a - _ -- $non_repeating_flag_or_option)"
                set non_repeating_flags_or_options_absent 1
                break
            end
        end
        test (count $unparsed_tokens) -eq 0 -o \( -z "$is_repeating_positional" -a "$positional_index" -gt "$positional_count" \) && break
    end
end

function __lmx-notify_complete_directories
    set -l token (commandline -t)
    string match -- '*/' $token
    set -l subdirs $token*/
    printf %s\n $subdirs
end

function __lmx-notify_custom_completion
    set -x SAP_SHELL fish
    set -x SAP_SHELL_VERSION $FISH_VERSION
    set -l tokens (__lmx-notify_tokens -p)
    if test -z "$(__lmx-notify_tokens -t)"
        set -l index (count (__lmx-notify_tokens -pc))
        set tokens $tokens[..$index] \'\' $tokens[(math $index + 1)..]
    end
    command $tokens[1] $argv $tokens
end

complete -c 'lmx-notify' -f
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify" socket' -l 'socket' -d 'The agent\'s socket (default: your agent\'s, else the system agent\'s).' -rfka ''
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify" interval' -l 'interval' -d 'Least seconds between two notifications of one kind.' -rfka ''
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify" expiry-warning' -l 'expiry-warning' -d 'Warn of a pairing this many hours before it expires.' -rfka ''
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify" open-with' -l 'open-with' -d 'The program that opens the dashboard\'s URL when a notification is clicked.' -rfka ''
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_positional "lmx-notify" -eq 1' -fa 'help' -d 'Show subcommand help information.'
complete -c 'lmx-notify' -n '__lmx-notify_should_offer_completions_for_flags_or_options "lmx-notify help" version' -l 'version' -d 'Show the version.'
